/* The stand-in <Metal/Metal.h>: the subset of Apple's Metal API the backend
 * uses, declared as Apple declares it (selectors, argument types, enum
 * values). Checked against tests/metal/apple_api.txt (extracted from Apple's
 * metal-cpp) by the metal_api_drift test. Linux test builds only. */
#ifndef MF_STANDIN_METAL_H
#define MF_STANDIN_METAL_H

#import <Foundation/Foundation.h>

#ifndef MTL_EXTERN
#define MTL_EXTERN extern
#endif

NS_ASSUME_NONNULL_BEGIN

@protocol MTLDevice;
@protocol MTLCommandQueue;
@protocol MTLCommandBuffer;
@protocol MTLComputeCommandEncoder;
@protocol MTLFunction;
@protocol MTLLibrary;
@protocol MTLComputePipelineState;
@protocol MTLBuffer;

typedef double CFTimeInterval;

/* ---- MTLTypes.h ---- */
typedef struct {
    NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth)
{
    MTLSize s = { width, height, depth };
    return s;
}

/* ---- MTLResource.h ---- */
typedef NS_ENUM(NSUInteger, MTLPurgeableState) {
    MTLPurgeableStateKeepCurrent = 1,
    MTLPurgeableStateNonVolatile = 2,
    MTLPurgeableStateVolatile = 3,
    MTLPurgeableStateEmpty = 4,
};

typedef NS_ENUM(NSUInteger, MTLCPUCacheMode) {
    MTLCPUCacheModeDefaultCache = 0,
    MTLCPUCacheModeWriteCombined = 1,
};

typedef NS_ENUM(NSUInteger, MTLStorageMode) {
    MTLStorageModeShared = 0,
    MTLStorageModeManaged = 1,
    MTLStorageModePrivate = 2,
    MTLStorageModeMemoryless = 3,
};

typedef NS_ENUM(NSUInteger, MTLHazardTrackingMode) {
    MTLHazardTrackingModeDefault = 0,
    MTLHazardTrackingModeUntracked = 1,
    MTLHazardTrackingModeTracked = 2,
};

#define MTLResourceCPUCacheModeShift 0
#define MTLResourceStorageModeShift 4
#define MTLResourceHazardTrackingModeShift 8

typedef NS_OPTIONS(NSUInteger, MTLResourceOptions) {
    MTLResourceCPUCacheModeDefaultCache = 0,
    MTLResourceCPUCacheModeWriteCombined = 1,
    MTLResourceStorageModeShared = 0,
    MTLResourceStorageModeManaged = 16,
    MTLResourceStorageModePrivate = 32,
    MTLResourceStorageModeMemoryless = 48,
    MTLResourceHazardTrackingModeDefault = 0,
    MTLResourceHazardTrackingModeUntracked = 256,
    MTLResourceHazardTrackingModeTracked = 512,
    MTLResourceOptionCPUCacheModeDefault = 0,
    MTLResourceOptionCPUCacheModeWriteCombined = 1,
};

@protocol MTLResource <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
@property (readonly) MTLCPUCacheMode cpuCacheMode;
@property (readonly) MTLStorageMode storageMode;
@property (readonly) MTLHazardTrackingMode hazardTrackingMode;
@property (readonly) MTLResourceOptions resourceOptions;
@property (readonly) NSUInteger allocatedSize;
@end

/* ---- MTLBuffer.h ---- */
@protocol MTLBuffer <MTLResource>
@property (readonly) NSUInteger length;
- (void *)contents;
@end

/* ---- MTLLibrary.h ---- */
typedef NS_ENUM(NSUInteger, MTLLanguageVersion) {
    MTLLanguageVersion1_0 = 65536,
    MTLLanguageVersion1_1 = 65537,
    MTLLanguageVersion1_2 = 65538,
    MTLLanguageVersion2_0 = 131072,
    MTLLanguageVersion2_1 = 131073,
    MTLLanguageVersion2_2 = 131074,
    MTLLanguageVersion2_3 = 131075,
    MTLLanguageVersion2_4 = 131076,
};

typedef NS_ENUM(NSUInteger, MTLLibraryError) {
    MTLLibraryErrorUnsupported = 1,
    MTLLibraryErrorInternal = 2,
    MTLLibraryErrorCompileFailure = 3,
    MTLLibraryErrorCompileWarning = 4,
    MTLLibraryErrorFunctionNotFound = 5,
    MTLLibraryErrorFileNotFound = 6,
};

MTL_EXTERN NSString *const MTLLibraryErrorDomain;

@interface MTLCompileOptions : NSObject <NSCopying> {
@public
    NSDictionary *_preprocessorMacros;
    BOOL _fastMathEnabled;
    MTLLanguageVersion _languageVersion;
}
@property (nullable, readwrite, copy, nonatomic) NSDictionary<NSString *, NSObject *> *preprocessorMacros;
@property (readwrite, nonatomic) BOOL fastMathEnabled;
@property (readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLFunction <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
@property (readonly) NSString *name;
@end

@protocol MTLLibrary <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
- (nullable id<MTLFunction>)newFunctionWithName:(NSString *)functionName;
@property (readonly) NSArray<NSString *> *functionNames;
@end

/* ---- MTLComputePipeline.h ---- */
@protocol MTLComputePipelineState <NSObject>
@property (nullable, readonly) NSString *label;
@property (readonly) id<MTLDevice> device;
@property (readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property (readonly) NSUInteger threadExecutionWidth;
@property (readonly) NSUInteger staticThreadgroupMemoryLength;
@end

/* ---- MTLCommandEncoder.h ---- */
typedef NS_OPTIONS(NSUInteger, MTLBarrierScope) {
    MTLBarrierScopeBuffers = 1,
    MTLBarrierScopeTextures = 2,
    MTLBarrierScopeRenderTargets = 4,
};

@protocol MTLCommandEncoder <NSObject>
@property (readonly) id<MTLDevice> device;
@property (nullable, copy, atomic) NSString *label;
- (void)endEncoding;
@end

/* ---- MTLCommandBuffer.h ---- */
typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus) {
    MTLCommandBufferStatusNotEnqueued = 0,
    MTLCommandBufferStatusEnqueued = 1,
    MTLCommandBufferStatusCommitted = 2,
    MTLCommandBufferStatusScheduled = 3,
    MTLCommandBufferStatusCompleted = 4,
    MTLCommandBufferStatusError = 5,
};

MTL_EXTERN NSString *const MTLCommandBufferErrorDomain;

typedef NS_ENUM(NSUInteger, MTLCommandBufferError) {
    MTLCommandBufferErrorNone = 0,
    MTLCommandBufferErrorInternal = 1,
    MTLCommandBufferErrorTimeout = 2,
    MTLCommandBufferErrorPageFault = 3,
    MTLCommandBufferErrorAccessRevoked = 4,
    MTLCommandBufferErrorNotPermitted = 7,
    MTLCommandBufferErrorOutOfMemory = 8,
    MTLCommandBufferErrorInvalidResource = 9,
    MTLCommandBufferErrorMemoryless = 10,
    MTLCommandBufferErrorDeviceRemoved = 11,
    MTLCommandBufferErrorStackOverflow = 12,
};

typedef NS_ENUM(NSUInteger, MTLDispatchType) {
    MTLDispatchTypeSerial = 0,
    MTLDispatchTypeConcurrent = 1,
};

typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

@protocol MTLCommandBuffer <NSObject>
@property (readonly) id<MTLDevice> device;
@property (readonly) id<MTLCommandQueue> commandQueue;
@property (nullable, copy, atomic) NSString *label;
- (void)enqueue;
- (void)commit;
- (void)addScheduledHandler:(MTLCommandBufferHandler)block;
- (void)waitUntilScheduled;
- (void)addCompletedHandler:(MTLCommandBufferHandler)block;
- (void)waitUntilCompleted;
@property (readonly) MTLCommandBufferStatus status;
@property (nullable, readonly) NSError *error;
@property (readonly) CFTimeInterval GPUStartTime;
@property (readonly) CFTimeInterval GPUEndTime;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (nullable id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)dispatchType;
@end

/* ---- MTLComputeCommandEncoder.h ---- */
@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
@property (readonly) MTLDispatchType dispatchType;
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void *)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(nullable id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBufferOffset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)memoryBarrierWithScope:(MTLBarrierScope)scope;
@end

/* ---- MTLCommandQueue.h ---- */
@protocol MTLCommandQueue <NSObject>
@property (nullable, copy, atomic) NSString *label;
@property (readonly) id<MTLDevice> device;
- (nullable id<MTLCommandBuffer>)commandBuffer;
- (nullable id<MTLCommandBuffer>)commandBufferWithUnretainedReferences;
@end

/* ---- MTLDevice.h ---- */
typedef NS_ENUM(NSInteger, MTLGPUFamily) {
    MTLGPUFamilyApple1 = 1001,
    MTLGPUFamilyApple2 = 1002,
    MTLGPUFamilyApple3 = 1003,
    MTLGPUFamilyApple4 = 1004,
    MTLGPUFamilyApple5 = 1005,
    MTLGPUFamilyApple6 = 1006,
    MTLGPUFamilyApple7 = 1007,
    MTLGPUFamilyApple8 = 1008,
    MTLGPUFamilyMac1 = 2001,
    MTLGPUFamilyMac2 = 2002,
    MTLGPUFamilyCommon1 = 3001,
    MTLGPUFamilyCommon2 = 3002,
    MTLGPUFamilyCommon3 = 3003,
};

@protocol MTLDevice <NSObject>
@property (readonly) NSString *name;
@property (readonly) uint64_t registryID;
@property (readonly) MTLSize maxThreadsPerThreadgroup;
@property (readonly) BOOL hasUnifiedMemory;
@property (readonly) uint64_t recommendedMaxWorkingSetSize;
@property (readonly) NSUInteger maxThreadgroupMemoryLength;
@property (readonly) NSUInteger maxBufferLength;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
- (nullable id<MTLCommandQueue>)newCommandQueue;
- (nullable id<MTLCommandQueue>)newCommandQueueWithMaxCommandBufferCount:(NSUInteger)maxCommandBufferCount;
- (nullable id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLBuffer>)newBufferWithBytes:(const void *)pointer length:(NSUInteger)length options:(MTLResourceOptions)options;
- (nullable id<MTLBuffer>)newBufferWithBytesNoCopy:(void *)pointer length:(NSUInteger)length options:(MTLResourceOptions)options deallocator:(void (^_Nullable)(void *pointer, NSUInteger length))deallocator;
- (nullable id<MTLLibrary>)newDefaultLibrary;
- (nullable id<MTLLibrary>)newLibraryWithURL:(NSURL *)url error:(NSError **)error;
- (nullable id<MTLLibrary>)newLibraryWithSource:(NSString *)source options:(nullable MTLCompileOptions *)options error:(NSError **)error;
- (nullable id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction error:(NSError **)error;
@end

MTL_EXTERN id<MTLDevice> _Nullable MTLCreateSystemDefaultDevice(void);

/* ---- MTLCaptureManager.h ---- */
typedef NS_ENUM(NSInteger, MTLCaptureError) {
    MTLCaptureErrorNotSupported = 1,
    MTLCaptureErrorAlreadyCapturing = 2,
    MTLCaptureErrorInvalidDescriptor = 3,
};

typedef NS_ENUM(NSInteger, MTLCaptureDestination) {
    MTLCaptureDestinationDeveloperTools = 1,
    MTLCaptureDestinationGPUTraceDocument = 2,
};

MTL_EXTERN NSString *const MTLCaptureErrorDomain;

@interface MTLCaptureDescriptor : NSObject <NSCopying> {
@public
    id _captureObject;
    MTLCaptureDestination _destination;
    NSURL *_outputURL;
}
@property (nonatomic, strong, nullable) id captureObject;
@property (nonatomic, assign) MTLCaptureDestination destination;
@property (nonatomic, copy, nullable) NSURL *outputURL;
@end

@interface MTLCaptureManager : NSObject {
@public
    BOOL _isCapturing;
}
+ (MTLCaptureManager *)sharedCaptureManager;
- (BOOL)supportsDestination:(MTLCaptureDestination)destination;
- (BOOL)startCaptureWithDescriptor:(MTLCaptureDescriptor *)descriptor error:(NSError **)error;
- (void)stopCapture;
@property (readonly) BOOL isCapturing;
@end

NS_ASSUME_NONNULL_END

#endif
